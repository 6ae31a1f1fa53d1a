"""The container runtime's side: an NRI plugin whose hooks move a pod's NICs in and back.

``mux`` and ``ttrpc`` (the framing, bounded) under ``plugin`` (register, dispatch, reconnect);
``handover`` (acts only while this instance holds the node lease) over ``hooks`` (``NRIHooks``:
which pods have NICs of ours and what each event asks of them; a pod that started while no driver
was connected gets its NICs at the next Synchronize or its first CreateContainer), over
``pod_attach`` (RunPodSandbox: a pod's NICs planned, moved in and configured, all or nothing),
over ``nic_return`` (Stop/Remove, every rollback and Synchronize give them back as recorded) and
``claim_reports`` (what the claims' status is told, and the runtime's error), over ``pod_plan``
(each NIC's plan and record), over ``shares`` (sub-interfaces of shared NICs, their leases and
limits), over ``adoption`` (NICs found in a pod's namespace when ``pods.json`` was lost),
``container_adjustment`` (each container's RDMA devices, environment and cpuset), ``dad_watch``
(the pods' new IPv6 addresses under duplicate address detection, followed off the hooks' path),
``step_clock`` (each hook's steps timed, and the fault injection), ``pod_netns`` (a pod's
namespace: its path, alive or not, held open) and ``address_pool`` (the shares' addresses).

May import: ``driver.nic_settings``, ``driver.claims``, ``driver.checkpoint``, ``driver.netlink``,
``driver.node_lease`` (``handover``), ``driver.metrics`` (``plugin``), ``driver.model``,
``dranet_proto``, ``driver.config``.
"""
