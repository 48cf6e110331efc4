#!/bin/bash
A=/work/wt-qcpu/build-seed/src/arbiter
cd /tmp/qcpu-bench
for rep in 1 2; do
for m in q4_k_m q8_0; do
for aq in 1 0; do
  [ $rep = 2 ] && [ $aq = 0 ] && continue
  l0=$(cut -d' ' -f1 /proc/loadavg)
  ARBITER_CPU_ACT_QUANT=$aq $A bench -m /tmp/qcpu-q3-$m.gguf --device cpu -t 2 -p 32 -n 16 -r 3 --json-out $m-aq$aq-rep$rep.json > $m-aq$aq-rep$rep.txt 2>&1
  l1=$(cut -d' ' -f1 /proc/loadavg)
  echo "$m aq=$aq rep=$rep load $l0 / $l1" >> loads.txt
done; done; done
echo done >> loads.txt
