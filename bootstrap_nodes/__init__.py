"""Bootstrap nodes ("antediluvians"): signed peer lists that let any relay join the mesh.

They hold minimal state (relay records), never route, and are trusted for nothing but
introductions: every record they hand out is signed by the relay it describes, and was proven
reachable by a QUIC handshake with that relay's node key before it was listed.
"""
