"""``dra.net/v1alpha1`` ``NetworkConfig``: the typed claim configuration and everything about its
language, in one place, doing no I/O (the webhook and ``dranet validate`` import only this).

``network_config`` (the typed config, its canonical JSON form, defaults, field-wise merge) and
``fields`` (strict JSON readers collecting every field error with its path; ``ConfigError``), under
``decode`` (one opaque config; ``decode_interface``, ``decode_routing``), under ``merge`` (which
configs apply to a request, in DRA order), under ``conflicts`` (what two NICs of one claim cannot
share), under ``schema`` (the JSON Schema generated from the typed config, shipped with the chart
for editors), under ``validation`` (whole claims and manifests, for the webhook and
``dranet validate``).
"""
