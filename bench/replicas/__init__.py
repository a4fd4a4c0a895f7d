"""`fairgate bench replicas`: several gateway replicas on one Redis in front of shared backends.

`share.py` measures the split two replicas give two weighted tenants of one saturated pool,
with the pool's fair share across replicas (gateway/share.py) and with each replica fair only to
its own jobs.
"""
