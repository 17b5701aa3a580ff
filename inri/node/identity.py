"""Re-export: the node identity lives in the shared layer (inri.common.identity) since the bootstrap uses it too."""

from inri.common.identity import KEY_FILE_MAGIC, NodeIdentity

__all__ = ["KEY_FILE_MAGIC", "NodeIdentity"]
