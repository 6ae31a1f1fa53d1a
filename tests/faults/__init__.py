"""Systematic fault injection: kill -9 after every netlink operation and every state-file step of
prepare, RunPodSandbox and StopPodSandbox, then restart and check nothing is lost
(runner.py does the work; test_fault_injection.py runs it and asserts the counts)."""
