#!/bin/sh
# Stands in for an nvcc that hangs: a diagnostic, then blank lines (as the CUDA
# front end prints between diagnostics), then nothing until it is killed.
echo 'kernel.cu(3): warning #177-D: variable "unused" was declared but never referenced'
echo 'still compiling kernel.cu'
i=0
while [ "$i" -lt 30 ]; do echo; i=$((i + 1)); done
exec sleep 300
