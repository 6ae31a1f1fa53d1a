"""Crash-safe driver state: prepared claims and the network state of running pods, on disk.

``store`` (``CheckpointStore``: the in-memory state, reloaded when another driver instance
replaced a file, changed under an ``flock``, every change saved before it returns) uses ``state``
(``PreparedClaim``, ``PodNetState``, ``DriverState``: the records and their plain JSON form),
``schema`` (file versions, migrations from older ones, refusal of newer ones) and ``files``
(checked durable writes through ``FileOps``, leftover temporary files removed, corrupt files moved
aside); ``errors`` (``CheckpointError``, ``CheckpointWriteError``) is below them all.

May import: ``driver.model``. Never the claims, kubelet, NRI or netlink packages: they all build
on this state.
"""
