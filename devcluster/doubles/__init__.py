"""Stand-ins for hardware and drivers this machine lacks, named as such: sysfs trees shaped like the
kernel's (from ``topologies/*.yaml``), and a TEST DOUBLE of the NVIDIA GPU DRA driver."""
