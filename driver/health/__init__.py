"""This node's devices as ResourceSlices: ``slices`` builds the bodies and the write plan (pure),
``publisher`` keeps the API server's slices equal to the inventory (coalesced, watched).

May import: ``driver.kube``, ``driver.model``, ``driver.config``.
"""
