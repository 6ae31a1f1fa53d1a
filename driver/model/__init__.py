"""The vocabulary every layer shares: ``device`` (a published Device, its attributes and host
facts) and ``network_config`` (a claim's typed config, as decoded once and stored).

May import: ``driver.config``.
"""
