"""`inri relay rotate-key`: a new identity for a stopped relay, the old one withdrawn at the bootstraps.

The old key signs a withdrawal (its record with capacity 0 and a higher sequence number: bootstrap_nodes
drop the identity at once and never list it again until the record expires) before it is set aside
as `node.key.retired-<time>`; the new key is made in its place. Devices homed here keep working:
registrations do not name their home relay's key, only its API URL. Neighbours see a new relay.
"""

from __future__ import annotations

import os
import time
from typing import Any

from inri.common.identity import NodeIdentity
from inri.common.lock import DataDirBusy, DataDirLock
from inri.node.bootstrap_client import BootstrapClient, BootstrapError, load_seed_list, make_record
from inri.node.config import RelayConfig, public_addrs
from inri.node.datadir import KEY_FILE, DataDirError, load_identity


async def rotate_key(cfg: RelayConfig) -> dict[str, Any]:
    """Withdraw the old identity at the bootstraps, set its key aside, make a new one (the relay stopped)."""
    data = cfg.data_path
    if not (data / KEY_FILE).is_file():
        raise DataDirError(f"{data / KEY_FILE} does not exist: nothing to rotate")
    lock = DataDirLock(data, "relay")
    try:
        lock.acquire()
    except DataDirBusy as exc:
        raise DataDirError(f"{exc}: stop it before rotating its key") from None
    try:
        old = load_identity(data)
        addrs = public_addrs(cfg.relay.public_addr) or [cfg.relay.quic]
        now = time.time()
        withdrawal = make_record(old, addrs, None, 0, int(now * 1000), int(now))
        withdrawn_at: str | None = None
        error = ""
        async with BootstrapClient(list(cfg.relay.bootstrap) or load_seed_list()) as client:
            try:
                withdrawn_at = await client.announce(withdrawal)
            except BootstrapError as exc:
                error = str(exc)
        retired = data / f"{KEY_FILE}.retired-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}"
        os.replace(data / KEY_FILE, retired)
        new = NodeIdentity.load_or_create(data / KEY_FILE)
    finally:
        lock.release()
    return {"old_node_id": old.node_id, "new_node_id": new.node_id, "retired_key": str(retired),
            "withdrawn_at": withdrawn_at,
            "warning": None if withdrawn_at else f"no bootstrap took the withdrawal ({error}): the old record "
                                                  "expires on its own within [bootstrap] record_ttl_s (30 min)"}
