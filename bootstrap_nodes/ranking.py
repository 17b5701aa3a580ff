"""The bootstrap's proximity ranking: it lives in the shared layer (inri/common/ranking.py) so the
simulator's "built" topology ranks candidates with the very same function."""

from inri.common.ranking import Candidate, prefix_of, rank

__all__ = ["Candidate", "prefix_of", "rank"]
