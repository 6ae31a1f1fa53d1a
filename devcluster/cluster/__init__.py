"""Running a local cluster: the control plane on 127.0.0.1, real nodes in their own namespaces and
cgroups on a routed fabric, CoreDNS, the MPI Operator and the training example's MPIJobs, and ``up``/``down``."""
