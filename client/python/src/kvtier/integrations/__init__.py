"""Engine integrations. Each module imports its engine; import only the one you use:

- ``kvtier.integrations.vllm``: ``KvtierConnector``, a vLLM ``KVConnectorBase_V1``.
- ``kvtier.integrations.sglang``: ``KvtierStorage``, an SGLang ``HiCacheStorage`` backend.
"""
