"""Development-only tooling (not shipped), one subpackage each: builders (binaries and images), cluster
(a control plane and real nodes), doubles (stand-ins for hardware and drivers) and demo."""
