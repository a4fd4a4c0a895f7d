"""`fairgate bench replicas`: several gateway replicas on one Redis in front of shared backends.

`cli.py` runs the parts: `kill.py` (a replica killed mid-run: nothing lost), `share.py` (the
split two replicas give two weighted tenants), `scale.py` (what N replicas cost per call) and
`live.py` (the live check through 1 and 3 replicas); `gateways.py` runs replica processes.
"""

ADMIN_KEY = "fg_admin_bench_replicas"  # every replica these benchmarks start
