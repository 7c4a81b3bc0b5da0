#!/bin/sh
# One-shot: wait for the TiCDC server, then create the changefeed unless it already exists.
# Run by the `changefeed` service of docker-compose.yml in the pingcap/ticdc image (binary at /cdc).
#
#   TICDC_SERVER   TiCDC's API address            (default http://ticdc:8300)
#   CHANGEFEED_ID  changefeed id                  (default compose-demo)
#   SINK_URI       the Kafka sink URI             (default: canal-json with the TiDB extension, 3 partitions)
set -eu

CDC="${CDC_BIN:-/cdc}"
SERVER="${TICDC_SERVER:-http://ticdc:8300}"
ID="${CHANGEFEED_ID:-compose-demo}"
SINK_URI="${SINK_URI:-kafka://kafka:9092/tidb-cdc?protocol=canal-json&enable-tidb-extension=true&partition-num=3}"
WAIT_SECONDS="${WAIT_SECONDS:-180}"

waited=0
until "$CDC" cli capture list --server="$SERVER" >/dev/null 2>&1; do
    if [ "$waited" -ge "$WAIT_SECONDS" ]; then
        echo "create-changefeed: TiCDC at $SERVER did not answer within ${WAIT_SECONDS}s" >&2
        exit 1
    fi
    sleep 3
    waited=$((waited + 3))
done

if "$CDC" cli changefeed query --server="$SERVER" --changefeed-id="$ID" >/dev/null 2>&1; then
    echo "create-changefeed: changefeed $ID already exists"
    exit 0
fi

echo "create-changefeed: creating $ID -> $SINK_URI"
exec "$CDC" cli changefeed create --server="$SERVER" --changefeed-id="$ID" --sink-uri="$SINK_URI"
