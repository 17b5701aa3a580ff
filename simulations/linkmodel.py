"""What a lost packet costs on a relay link, per scenario `[network] loss_model` (docs/metrics.md).

- `drop`: the frame is gone; only the engine's own recovery (custody retries, ring searches, gossip
  redundancy) makes up for it. The simulator's behaviour before loss models existed.
- `quic`: relay links are QUIC streams (inri/node/quic.py), so on a live link a lost packet is
  retransmitted by QUIC, not lost: the frame arrives one probe timeout (PTO) late, a PTO that doubles
  for every further loss of the same data (RFC 9002 section 6.2), and frames sent after it on the same
  link wait for it (one stream: in-order delivery, head-of-line blocking). Frames to a relay that is
  down are still lost (the simulator drops them on arrival), as are frames over a cut link.

The PTO is aioquic's for application data (aioquic/quic/recovery.py, get_probe_timeout): smoothed RTT
+ max(4 x RTT variance, K_GRANULARITY) + max_ack_delay. The smoothed RTT is the path's round trip
plus the relays' own acknowledgement delay (inri/node/quic.py ACK_DELAY_S, 10 ms): aioquic subtracts a
reported ACK delay from an RTT sample only when the sample stays above min_rtt + that delay, and its
min_rtt already holds the delay (every packet of a one-way flow is acknowledged ACK_DELAY_S late), so
it never does. Measured on two impaired endpoints (50 ms each way): min_rtt 112 ms, smoothed RTT 115
to 117 ms, PTO 148 to 163 ms, a retransmitted frame 150 to 170 ms late; on 8 lab relays (their
/v1/status rtt_ms): smoothed RTT 110 to 115 ms, PTO 158 to 176 ms (docs/metrics.md). A simulated
link has a constant latency, so its RTT variance settles near 0: PTO = RTT + 10 ms + 1 ms + 25 ms.
Real relays' RTT samples also hold the time their host takes to get to each datagram (both ends), and
vary with it: the lab twin (simulations/lab.py) passes that share, measured from the lab's traces, as
`host_s` (mean) and `rttvar` (mean deviation); scenarios leave both 0.
"""

from __future__ import annotations

from collections.abc import Callable

K_GRANULARITY_S = 0.001  # aioquic/quic/congestion/base.py (RFC 9002: kGranularity)
MAX_ACK_DELAY_S = 0.025  # aioquic QuicPacketRecovery.max_ack_delay (RFC 9000 default)
# The relays' deliberate acknowledgement delay: inri/node/quic.py ACK_DELAY_S (not imported: the
# simulator does not load aioquic; tests/test_impaired_links.py checks the two agree).
ACK_DELAY_S = 0.010
MAX_BACKOFF = 6  # PTO doublings modelled for one frame (aioquic's idle timeout ends a link long before)
# Rule C6: the transport reports a neighbour unresponsive when a frame has gone unacknowledged through
# two probe timeouts in a row (PTO, then the probe's doubled PTO: 3 PTOs after the frame left; the
# daemon watches aioquic's PTO count, inri/node/quic.py). The simulator reports it under both loss
# models for frames to a relay that is down and over a cut link, and under `quic` also when a frame's
# first two transmissions are lost on a live link (what QUIC's loss detection sees there too).
UNACKED_PTOS = 3.0


def probe_timeout(rtt: float, rttvar: float = 0.0) -> float:
    """aioquic's PTO on a link with this (settled) round-trip time and RTT variance: its smoothed RTT
    holds the peer's acknowledgement delay (module docstring)."""
    return rtt + ACK_DELAY_S + max(4.0 * rttvar, K_GRANULARITY_S) + MAX_ACK_DELAY_S


def retransmit_delay(rtt: float, loss: float, rand: Callable[[], float], rttvar: float = 0.0) -> float:
    """Extra delay of a frame whose first packet was lost: one PTO, doubled for each further loss."""
    pto = probe_timeout(rtt, rttvar)
    extra = pto
    for _ in range(MAX_BACKOFF):
        if rand() >= loss:
            break
        pto *= 2.0
        extra += pto
    return extra
