# ctest kvtier_engine_standalone_host: runs kvtier-engine-standalone on host emulation with
# small shapes and checks that it exits 0 and prints every figure (the three TTFTs, load
# only, compute only, overlap ratio, recompute vs GEMM ratio, a passing bit-exact verify).
# No timing thresholds. Usage: cmake -DENGINE=/path/to/kvtier-engine-standalone -P this
if(NOT ENGINE)
  message(FATAL_ERROR "pass -DENGINE=<path of kvtier-engine-standalone>")
endif()
execute_process(
  COMMAND ${ENGINE} --backend host --model tiny-engine --prompt-tokens 200 --cached-tokens 128
          --chunk-tokens 64 --iterations 2
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvtier-engine-standalone exited with ${rc}")
endif()
set(num "[0-9]+(\\.[0-9]+)?")
foreach(figure
    "TTFT \\(a\\) recompute everything: +${num} ms"
    "TTFT \\(b\\) load prefix, then compute: +${num} ms"
    "TTFT \\(c\\) layerwise load \\+ compute: +${num} ms"
    "load only: +${num} ms"
    "compute only \\(72 new tokens\\): +${num} ms"
    "overlap ratio \\(c\\) / max\\(load, compute\\): +${num}"
    "recompute ${num} TFLOP/s vs plain GEMMs of the same shapes ${num} TFLOP/s: ratio ${num}"
    "verify: OK: [1-9][0-9]* bytes of loaded KV compared with the stored KV, 0 rows differ"
    "prefill \\+ layerwise store: +${num} ms \\(2 chunks stored\\)")
  if(NOT out MATCHES "${figure}")
    message(FATAL_ERROR "kvtier-engine-standalone did not print a line matching '${figure}'")
  endif()
endforeach()
if(NOT out MATCHES "copy path dma")
  message(FATAL_ERROR "kvtier-engine-standalone did not name its default copy path (dma)")
endif()

# The other copy path loads bit-exact too, and a copy path it does not know is a usage error.
execute_process(
  COMMAND ${ENGINE} --backend host --model tiny-engine --prompt-tokens 200 --cached-tokens 128
          --chunk-tokens 64 --iterations 1 --copy-path zero_copy
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "copy path zero_copy"
   OR NOT out MATCHES "verify: OK: [1-9][0-9]* bytes of loaded KV compared with the stored KV, 0 rows differ")
  message(FATAL_ERROR "kvtier-engine-standalone --copy-path zero_copy: exit ${rc}, no verified load")
endif()
execute_process(
  COMMAND ${ENGINE} --backend host --copy-path dmaa
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--copy-path must be dma or zero_copy, not 'dmaa'")
  message(FATAL_ERROR "--copy-path dmaa: exit ${rc}, stderr '${err}' (want exit 2 naming the value)")
endif()
