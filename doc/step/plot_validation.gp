# plot_validation.gp - fr_step's predicted against measured step times,
# from the validation.dat that perf/step/validate.sh writes (columns:
# model mode ranks measured_ms predicted_ms error_pct):
#   gnuplot -e "dir='OUTDIR'" doc/step/plot_validation.gp
# makes OUTDIR/validation.png: left, every (model, mode, ranks) as a
# point, predicted against measured, with the +-15 % band; right, the
# error of each against the number of ranks.
if (!exists("dir")) dir = "."
dat = dir."/validation.dat"
modes = "after overlap overlap_bf16 overlap_int8_ef"
set terminal pngcairo noenhanced size 1400,600 font ",10"
set output dir."/validation.png"
set multiplot layout 1,2 title "fr_step: predicted vs measured step time, one rank per netns host, 1 Gbit/s links"
set grid
set key top left
set xlabel "measured step (ms)"
set ylabel "predicted step (ms)"
set logscale xy
stats dat using 4 nooutput
lo = STATS_min / 1.3
hi = STATS_max * 1.3
set xrange [lo:hi]
set yrange [lo:hi]
set xtics (100, 150, 200, 300, 400, 500, 700, 1000, 1500)
set ytics (100, 150, 200, 300, 400, 500, 700, 1000, 1500)
plot x with lines lc rgb "black" title "predicted = measured", \
     1.15*x with lines dt 2 lc rgb "gray" title "+-15 %", \
     x/1.15 with lines dt 2 lc rgb "gray" notitle, \
     for [i=1:words(modes)] dat using (strcol(2) eq word(modes, i) ? $4 : NaN):5 \
         with points pt 7 ps 1.2 lc i title word(modes, i)
unset logscale
set logscale x 2
set xrange [1.6:11]
set yrange [-20:20]
set xtics (2, 4, 8)
set ytics auto
set xlabel "ranks (points of one n spread apart by mode)"
set ylabel "step time error, predicted vs measured (%)"
set key top right
plot 15 with lines dt 2 lc rgb "gray" title "+-15 %", \
     -15 with lines dt 2 lc rgb "gray" notitle, \
     0 with lines lc rgb "black" notitle, \
     for [i=1:words(modes)] dat using (strcol(2) eq word(modes, i) ? $3 * (0.92 + 0.04 * i) : NaN):6 \
         with points pt 7 ps 1.2 lc i title word(modes, i)
unset multiplot
