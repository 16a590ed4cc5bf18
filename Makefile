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

demo: $(STAMP)
	rm -rf runs/demo
	$(VENV)/bin/cptsim train --out runs/demo
	$(VENV)/bin/cptsim schedules show cpt --q-min 3 --q-max 8 --steps 1000 --plot runs/demo/schedule.png

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_quant_step.py

clean:
	rm -rf $(VENV) runs build *.egg-info
