"""Helpers only tests use: the webhook and a profile provider in-process, eBPF programs, a DHCP server,
a throwaway node for the hooks, a metadata server and a metrics-scraping driver."""
