"""The built-in ways of exchanging gradients, one module each (ps, sfb, allreduce).

Every module in this package is imported by ``strategy.registered()``, and each registers
its Strategy subclass on import, so a new built-in strategy is one new file here.
"""
