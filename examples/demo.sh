#!/usr/bin/env bash
# The EventBus demo on the embedded default stack: Ray, the Tansu Kafka-protocol broker, Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
EB=${EB:-.venv/bin/eventbus}
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0

echo "== eventbus test: the example's pipeline unit tests (no stack needed)"
$EB test examples/payments/payments.yaml

echo "== eventbus up: local Ray, Tansu broker, Redis on loopback"
$EB up

echo "== eventbus deploy"
$EB deploy examples/payments/payments.yaml

echo "== eventbus publish: 6 sample payments to topic 'payments'"
$EB publish payments --file examples/payments/events.jsonl

echo "== eventbus tail payments-large: the outputs (3 large payments expected)"
$EB tail payments-large --from-beginning --max 3 --timeout 60

echo "== eventbus tail payments-dlq: the event the function rejected"
$EB tail payments-dlq --from-beginning --max 1 --timeout 30

GW=$($EB url gateway)   # 8080 unless it was taken (then `up` said which port it took)
echo "== HTTP at the gateway ($GW): a plain JSON payment, answered synchronously (?wait=true)"
curl -sS -X POST "$GW/payments?wait=true" -H 'content-type: application/json' \
  -d '{"amount": 900, "currency": "EUR", "card": "4000-0000"}' -D - ; echo
echo "== HTTP, asynchronously: 202 once the event is durably in the pipeline's ingress topic"
curl -sS -X POST "$GW/v1/pipelines/large-payments/events?wait=false" -H 'content-type: application/json' \
  -H 'ce-specversion: 1.0' -H 'ce-id: web-1' -H 'ce-source: /shop/web' -H 'ce-type: payment.created' \
  -d '{"amount": 450, "currency": "USD", "card": "4000-0001"}' ; echo
$EB tail payments-large --from-beginning --max 4 --timeout 60

echo "== eventbus status"
$EB status large-payments
$EB list
echo
echo "The stack keeps running: try 'eventbus publish payments --type payment.created --data '{\"amount\": 300, \"currency\": \"USD\"}'"
echo "and 'eventbus tail payments-large'. Stop it with: $EB down"
