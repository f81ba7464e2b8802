# Token hit rate against capacity from kvtier-replay --sweep's CSV: the measured
# kvtier line and the offline LRU and Belady (OPT) references at the same
# capacity in chunks. kvtier-replay calls it as
#   gnuplot -e "csv='sweep.csv'; png='sweep.png'; plot_title='...'" tools/plot-sweep.gp
# CSV columns: 1 dram_bytes, 2 nvme_bytes, 3 capacity_chunks, 4 capacity_tokens,
# 8 token_hit_rate, 14 lru_hit_rate, 15 belady_hit_rate.
if (!exists("csv")) csv = 'sweep.csv'
if (!exists("png")) png = 'sweep.png'
if (!exists("plot_title")) plot_title = 'kvtier-replay sweep'
set terminal pngcairo size 900,560 font ",11"
set output png
set datafile separator ","
set key autotitle columnhead
set title plot_title noenhanced
set xlabel "cache capacity (million tokens; chunks x tokens per chunk, all tiers)"
set ylabel "token hit rate"
set yrange [0:*]
set xrange [0:*]
set grid
set key bottom right
plot csv using ($4/1e6):8 with linespoints lw 2 pt 7 title "kvtier (measured)", \
     csv using ($4/1e6):14 with linespoints lw 1.5 pt 5 dt 2 title "LRU (offline)", \
     csv using ($4/1e6):15 with linespoints lw 1.5 pt 9 dt 3 title "Belady/OPT (offline)"
