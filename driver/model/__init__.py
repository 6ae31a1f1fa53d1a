"""The vocabulary every layer shares: ``device`` (a published Device, its attributes and host
facts) and ``untrusted`` (the one bounded parser of JSON and YAML from outside).

May import: ``driver.config``.
"""
