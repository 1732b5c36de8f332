#!/bin/sh
# gen-random.sh N: N lines of COPY text for one bytea column, each 1 MiB from /dev/urandom
# (incompressible bytes for the benchmarks; used with COPY ... FROM PROGRAM).
i=0
while [ "$i" -lt "$1" ]; do
    printf '\\\\x'
    head -c 1048576 /dev/urandom | basenc --base16 -w0
    echo
    i=$((i + 1))
done
