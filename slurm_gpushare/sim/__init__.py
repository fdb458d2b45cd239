"""Trace-driven simulator: replay a trace (Philly, Alibaba openb, a site's sacct history) on a
simulated cluster under each scheduling policy, with the daemon's own decision code as the
``gpushare`` policy. See ``engine`` for the event loop and ``policies`` for the policies.
"""
