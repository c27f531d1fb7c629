#!/bin/sh
# A fa-bench from before the paired gate: it rejects --serve.
echo 'error: unexpected argument --serve' >&2
exit 2
