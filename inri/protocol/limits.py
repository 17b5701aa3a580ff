"""Wire limits. Every decoder enforces these; each says why it is what it is."""

# 2: registrations carry a receipt key and receipts a home relay's signature (docs/protocol.md).
PROTOCOL_VERSION = 2
# One relay-to-relay frame: a push (payload + carried registration) plus envelope must fit with room;
# 64 KiB keeps a single QUIC stream read bounded and one hostile frame cheap to refuse.
MAX_FRAME_BYTES = 64 * 1024
# Sealed payloads are "something new" signals (seed 003: minimal payloads), not content: 4 KiB is
# more than Web Push's 4,096-byte record minus overhead, and keeps a mailbox of 1,000 under 5 MB.
MAX_CIPHERTEXT_BYTES = 4096
# The TTL bound (docs/protocol.md, "TTLs"): how far any one frame can travel, not a guess at the mesh's
# diameter. Registration gossip starts with it (each relay forwards a (route, epoch) once, so its cost
# does not grow with the TTL) and a push following a route carries ttl = MAX_TTL - hops, so neither
# stops short on any mesh whose paths are shorter. Random 4-regular meshes of 10k relays have
# eccentricity up to 11; geographic 3-neighbour meshes of 5k relays up to 26, with latency-first
# gossip paths up to ~45 hops. 127 keeps ttl and hops one-byte msgpack fixints.
MAX_TTL = 127
# Expanding-ring search radii (AODV style): 1, 3, 5, 7, then the full TTL.
RING_RADII = (1, 3, 5, 7)
ROUTE_ID_BYTES = 16  # blake2b-128 of the one-off route key: collision-free at any plausible scale
PUSH_ID_BYTES = 16
TOKEN_BYTES = 16
KEY_BYTES = 32  # Ed25519 verify key / X25519 public key
SIGNATURE_BYTES = 64
MAX_EPOCH = 2**32 - 1
MAX_TIMESTAMP = 2**40  # seconds; msgpack overflows past 64 bits, we stay far below
MAX_LIFETIME_S = 30 * 24 * 3600  # a registration lives at most 30 days without refresh
MAX_PEERS_IN_EXCHANGE = 32  # a peer-exchange frame is a sample, not a directory
MAX_ANNOUNCE_LAG_MS = 65535  # an announcement's lag_ms (rule G9): larger lags are sent as this
MAX_ANNOUNCEMENTS = 256  # entries of one RegAnnounce frame (about 6 KiB): a longer batch goes in several frames
MAX_WITHDRAWN_ROUTES = 256  # entries of one RouteWithdraw frame (rule G12; about 6 KiB)
MAX_SYNCED_ROUTES = 256  # entries of one RouteSync frame (rule G11; about 6 KiB): more go in several frames
MAX_NODE_ID_CHARS = 64
# Receipts in one ReceiptBatch (rule F5b): about 22 bytes each, so a batch stays near 6 KiB; a home relay
# with more receipts of one route for one neighbour in a round sends several batches.
MAX_RECEIPTS_PER_BATCH = 256
MAX_ADDR_CHARS = 200
MAX_ERROR_DETAIL_CHARS = 500
MAX_NONCE = 2**63 - 1
# Web Push (RFC 8030): a Topic is at most 32 base64url characters; TTL is clamped to 30 days at most.
MAX_TOPIC_CHARS = 32
MAX_WEBPUSH_TTL_S = 30 * 24 * 3600
ENDPOINT_ID_BYTES = 16
WEBPUSH_TAG_BYTES = 16
