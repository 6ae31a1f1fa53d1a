"""Profile providers: who turns a claim's ``profile: <name>`` into network config (``--profile-provider``).

``provider_client`` speaks to dranet's webhook provider (``--profile-provider webhook --webhook-url
URL``; not to be confused with this driver's admission webhook, ``driver.webhook``): an
HTTP (or ``unix://``) endpoint asked for the profile's config at NodePrepareResources
(``POST /GetProfileConfig``) and told to free it at NodeUnprepareResources
(``POST /ReleaseProfileConfig``), with dranet's JSON bodies. What is done with the answer (strict
decoding, the merge under the claim's config) is :mod:`driver.claims.profile`'s.

May import: ``driver.model`` (the bounded JSON parser).
"""
