"""The container runtime's side: an NRI plugin whose hooks move a pod's NICs in and back.

``mux`` and ``ttrpc`` (the framing, bounded) under ``plugin`` (register, dispatch, reconnect);
``handover`` (acts only while this instance holds the node lease) over ``hooks`` (``NRIHooks``:
RunPodSandbox moves and configures a pod's NICs over a plan per NIC, running every NIC setting of
``driver.nic_settings``; Stop/Remove, every rollback and Synchronize give them back as recorded;
CreateContainer; a pod that started while no driver was connected gets its NICs at the next
Synchronize or its first CreateContainer), over ``adoption`` (NICs found in a pod's namespace when
``pods.json`` was lost), ``container_adjustment`` (each container's RDMA devices, environment and
cpuset) and ``dad_watch`` (the pods' new IPv6 addresses under duplicate address detection, followed
off the hooks' path).

May import: ``driver.nic_settings``, ``driver.claims``, ``driver.checkpoint``, ``driver.netlink``,
``driver.model``, ``dranet_proto``, ``driver.config``.
"""
