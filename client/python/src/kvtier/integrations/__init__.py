"""Engine integrations. Each module imports its engine; import only the one you use:

- ``kvtier.integrations.vllm``: ``KvtierConnector``, a vLLM ``KVConnectorBase_V1``.

An SGLang ``HiCacheStorage`` backend is not built yet.
"""
