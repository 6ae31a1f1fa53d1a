"""Crash-safe driver state: prepared claims and the network state of running pods, on disk.

``store`` (``CheckpointStore``: the in-memory state, reloaded when another driver instance
replaced a file, changed under an ``flock``, every change saved before it returns) uses ``state``
(``PreparedClaim``, ``PodNetState``, ``DriverState``: the records and their plain JSON form),
``schema`` (file versions, migrations from older ones, refusal of newer ones) and ``files``
(checked durable writes through ``FileOps``, leftover temporary files removed, corrupt files moved
aside); ``errors`` (``CheckpointError``, ``CheckpointWriteError``) is below them all.

The NICs of a pod keep what each NIC setting recorded to undo itself under the setting's name
(``MovedDevice.records``): the settings own the records' content, the state only keeps them.

May import: ``driver.api`` (the typed config prepared claims carry), ``driver.model`` and
``driver.config``. Never the claims, NRI, netlink or NIC settings packages: they all build on this
state.
"""
