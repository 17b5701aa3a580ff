#!/usr/bin/env bash
# Submit the INRI trace analysis to a Spark cluster.
# usage: deploy/spark/submit-standalone.sh MASTER_URL TRACE_DIR REPORT_DIR
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 MASTER_URL TRACE_DIR REPORT_DIR   (e.g. spark://spark-master:7077)" >&2
  exit 2
fi
master=$1 trace=$2 report=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
pkg=$(mktemp -d)/inri_analysis.zip
(cd "$root" && zip -qr "$pkg" spark_analysis)
exec spark-submit --master "$master" --deploy-mode client --py-files "$pkg" \
  --conf spark.sql.shuffle.partitions="${INRI_SHUFFLE_PARTITIONS:-64}" \
  "$root/spark_analysis/job.py" "$trace" "$report"
