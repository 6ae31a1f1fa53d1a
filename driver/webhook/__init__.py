"""``dranet webhook``: a validating admission webhook for dra.net claim configs (aiohttp, TLS).

It validates ResourceClaims and ResourceClaimTemplates (``resource.k8s.io/v1``) on CREATE
with the same validator as NodePrepareResources and ``dranet validate``
(:func:`driver.api.v1alpha1.validation.validate_claim_spec`); only configs with ``opaque.driver: dra.net``
are looked at. A rejection lists every problem as ``<field path>: <reason>``.

- :mod:`driver.webhook.handler`: which objects are judged, the verdict, the HTTP handler of every URL path.
- :mod:`driver.webhook.configuration`: the ValidatingWebhookConfiguration (``--manage-configuration``,
  matchConditions) and its registration.
- :mod:`driver.webhook.certificates`: the server's TLS files, given or self-signed at start.
- :mod:`driver.webhook.options`: the ``dranet webhook`` flags.
- :mod:`driver.webhook.server`: the TLS server (certificate reloaded on renewal), ``/healthz``; the entry point.

May import: the claim config language (``driver.api.v1alpha1.validation``), ``driver.kube``,
``driver.model`` (the bounded parser of a review) and ``driver.config``; never ``driver.cli`` or
``driver.daemon``.
"""
