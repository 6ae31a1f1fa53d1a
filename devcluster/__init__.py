"""Development-only tooling (not shipped), one subpackage each: builders (binaries and images), cluster
(a control plane and real nodes), doubles (stand-ins for hardware and drivers), demo, and guest_node
(a real node on a stock kernel under QEMU)."""
