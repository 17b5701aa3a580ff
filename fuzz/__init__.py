"""INRI's fuzz campaign, kept beside the package (like h11's fuzz/): a test tool, not runtime code.

`python -m fuzz --api URL --quic ADDR --node-id ID` fuzzes a relay of your own (fuzz/campaign.py).
"""
