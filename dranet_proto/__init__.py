"""Our copies of the kubelet, NRI and ttrpc wire contracts (``*.proto``) and their generated
stubs (``hack/gen_protos.py``; do not edit the ``_pb2`` files).

A package of its own, next to ``driver``: generated code is kept apart from the code we write.
"""
