"""The claim configuration API, one package per version (as Kubernetes API groups and dranet's
``pkg/apis``): ``v1alpha1`` (``dra.net/v1alpha1`` ``NetworkConfig``); and ``validate_cli``,
``dranet validate`` (manifest files in, one line per problem out).

May import: ``driver.model`` (the bounded parser of untrusted input), ``driver.config``.
"""
