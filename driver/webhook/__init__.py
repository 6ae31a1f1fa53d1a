"""``dranet webhook``: a kopf validating admission webhook for dra.net claim configs.

It validates ResourceClaims and ResourceClaimTemplates (``resource.k8s.io/v1``) on CREATE and
UPDATE with the same validator as NodePrepareResources and ``dranet validate``
(:func:`driver.api.v1alpha1.validation.validate_claim_spec`); only configs with ``opaque.driver: dra.net``
are looked at. A rejection lists every problem as ``<field path>: <reason>``.

- :mod:`driver.webhook.handler`: the validating handler and the HTTP front that runs it on any URL path.
- :mod:`driver.webhook.configuration`: the ValidatingWebhookConfiguration (``--manage-configuration``,
  matchConditions) and its registration.
- :mod:`driver.webhook.certificates`: the server's TLS files, given or self-signed at start.
- :mod:`driver.webhook.options`: the ``dranet webhook`` flags.
- :mod:`driver.webhook.server`: kopf's registry and settings, credentials, identity; the entry point.

May import: ``driver.admission``, the claim config language (``driver.api.v1alpha1.validation``), ``driver.kube``
and ``driver.config``; never ``driver.cli`` or ``driver.daemon``.
"""
