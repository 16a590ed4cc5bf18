# Both targets build their own virtual environment; nothing needs installing by hand.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The whole story on the embedded default (digits, digits-cnn): plan a schedule for 65% of the static-8-bit
# BitOPs on Bit Fusion, train exactly that plan, then report estimated vs executed cost.
demo: $(STAMP)
	rm -rf runs/demo
	mkdir -p runs/demo
	$(VENV)/bin/cptsim plan --budget 65% --hw bitfusion --out runs/demo/plan.json --plot runs/demo/plan.png
	$(VENV)/bin/cptsim train --plan runs/demo/plan.json --out runs/demo/run
	$(VENV)/bin/cptsim report runs/demo/run --hw bitfusion,h100,a100

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_quant_step.py

clean:
	rm -rf $(VENV) runs build *.egg-info
