"""Cloud topology attributes and per-NIC network config from the instance metadata services.

One module per provider (``gce``, ``aws``, ``azure``, ``oke``, ``alibaba``), each with a ``probe``
(is this that cloud?), a ``fetch`` (the instance's metadata, parsed and checked) and an instance
type answering per-device questions (:class:`~driver.inventory.cloud.base.CloudInstance`);
``detection`` picks the provider like the Go driver does; ``metadata`` is the one HTTP client
(``--cloud-metadata-url`` replaces every service's host); ``service.CloudMetadata`` runs it all in
the background so a slow, down or lying metadata service never delays or breaks discovery.

Attribute and header names, request paths and response formats are those of the real services and
of the Go reference driver (kubernetes-sigs/dranet ``pkg/cloudprovider``), so its users' claims
select the same attributes. Part of ``driver.inventory``: may import ``driver.model`` and
``driver.config`` only.
"""
