.PHONY: demo test lint docs dashboards bench bench-instructions stack-up stack-down gpu-wheels

demo:            ## set up and run the demo training job
	scripts/demo

test:            ## set up and run every test
	scripts/test

lint:
	.venv/bin/ruff check otel_train tests benchmarks examples grafana
	.venv/bin/ruff format --check otel_train tests benchmarks examples grafana

docs:            ## regenerate docs/telemetry.md and the schema file schemas/<version> from the telemetry contract
	.venv/bin/otel-train telemetry > docs/telemetry.md
	.venv/bin/python -c "from otel_train import contract as c; open('schemas/' + c.SCHEMA_VERSION, 'w').write(c.render_schema())"

dashboards:      ## regenerate grafana/ (dashboards and provisioning) from grafana/build.py
	.venv/bin/python grafana/build.py

bench:           ## CPU overhead benchmark (figures printed side by side)
	.venv/bin/python benchmarks/overhead.py

bench-instructions: ## the same cost in instructions under callgrind (needs valgrind; ~4 min)
	.venv/bin/python benchmarks/instructions.py

stack-up:
	scripts/stack build && scripts/stack up

stack-down:
	scripts/stack down

gpu-wheels:      ## wheels for the lent GPU machine (then run scripts/gpu-check there)
	scripts/gpu-wheels
