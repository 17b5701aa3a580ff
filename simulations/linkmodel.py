"""What a lost packet costs on a relay link, per scenario `[network] loss_model` (docs/metrics.md).

- `drop`: the frame is gone; only the engine's own recovery (custody retries, ring searches, gossip
  redundancy) makes up for it. The simulator's behaviour before loss models existed.
- `quic`: relay links are QUIC streams (inri/node/quic.py), so on a live link a lost packet is
  retransmitted by QUIC, not lost: the frame arrives one probe timeout (PTO) late, a PTO that doubles
  for every further loss of the same data (RFC 9002 section 6.2), and frames sent after it on the same
  link wait for it (one stream: in-order delivery, head-of-line blocking). Frames to a relay that is
  down are still lost (the simulator drops them on arrival), as are frames over a cut link.

The PTO is aioquic's for application data (aioquic/quic/recovery.py, get_probe_timeout): smoothed RTT
+ max(4 x RTT variance, K_GRANULARITY) + max_ack_delay. A simulated link has a constant latency, so
its RTT variance settles near 0: PTO = RTT + 1 ms + 25 ms.
"""

from __future__ import annotations

from collections.abc import Callable

K_GRANULARITY_S = 0.001  # aioquic/quic/congestion/base.py (RFC 9002: kGranularity)
MAX_ACK_DELAY_S = 0.025  # aioquic QuicPacketRecovery.max_ack_delay (RFC 9000 default)
MAX_BACKOFF = 6  # PTO doublings modelled for one frame (aioquic's idle timeout ends a link long before)
# Rule C6: the transport reports a neighbour unresponsive when a frame has gone unacknowledged through
# two probe timeouts in a row (PTO, then the probe's doubled PTO: 3 PTOs after the frame left; the
# daemon watches aioquic's PTO count, inri/node/quic.py). The simulator reports it under both loss
# models for frames to a relay that is down and over a cut link, and under `quic` also when a frame's
# first two transmissions are lost on a live link (what QUIC's loss detection sees there too).
UNACKED_PTOS = 3.0


def probe_timeout(rtt: float) -> float:
    """aioquic's PTO on a link with this (settled) round-trip time."""
    return rtt + K_GRANULARITY_S + MAX_ACK_DELAY_S


def retransmit_delay(rtt: float, loss: float, rand: Callable[[], float]) -> float:
    """Extra delay of a frame whose first packet was lost: one PTO, doubled for each further loss."""
    pto = probe_timeout(rtt)
    extra = pto
    for _ in range(MAX_BACKOFF):
        if rand() >= loss:
            break
        pto *= 2.0
        extra += pto
    return extra
