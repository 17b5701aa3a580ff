"""`python -m fuzz`: the campaign's command line (fuzz/campaign.py)."""

from fuzz.campaign import main

raise SystemExit(main())
