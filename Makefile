# dsv4deploy: `make deploy PROFILE=nvfp4-ctx8k` and `make test` on a fresh Debian machine.
# Make bootstraps what it needs: Debian packages (as root, or through sudo) and a .venv.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PROFILE ?= nvfp4-ctx8k
INVENTORY ?= inventory/sim.py
OUT ?= rendered/$(PROFILE)
HOSTS ?= 1
PYTEST_ARGS ?=

VENV := .venv
BIN := $(VENV)/bin
DEBS := debootstrap systemd-container systemd openssh-client rsync patch ca-certificates python3-venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SIM := $(filter inventory/sim.py,$(INVENTORY))

.PHONY: help bootstrap debs venv test validate render pin plan deploy rollback history sim-up sim-down sim-status clean

help:
	@echo "make deploy PROFILE=nvfp4-ctx8k [INVENTORY=inventory/ct200.py]   roll a profile out (default: the local CT200 twin)"
	@echo "make plan PROFILE=...        show what a deploy would change, change nothing"
	@echo "make rollback [TO=NNNN]      back to the previous (or the named) release that passed"
	@echo "make history                 the host's releases: profile, status, gate, reason"
	@echo "make test                    the whole test suite (needs root for the twin)"
	@echo "make validate PROFILE=...    check a profile, print its GPU-memory budget"
	@echo "make render PROFILE=...      write the rendered unit, NCCL env, manifest under rendered/"
	@echo "make pin PROFILE=... [BRANCH=main] [INTO_BASE=1]   write the model repo's current commit into the profile"
	@echo "make sim-up / sim-down / sim-status   the local CT200 twin"

bootstrap: debs venv

debs: .cache/debs.stamp
.cache/debs.stamp:
	@missing=$$(for p in $(DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p .cache && touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,twin]'
	@touch $@

validate: venv
	$(BIN)/dsv4deploy validate $(PROFILE)

render: venv
	$(BIN)/dsv4deploy validate $(PROFILE) >/dev/null || { $(BIN)/dsv4deploy validate $(PROFILE); exit 2; }
	$(BIN)/dsv4deploy render $(PROFILE) --out $(OUT)

# Pinning names its profile: the default PROFILE is for trying the twin, not for editing a file.
pin: venv
	@if [ "$(origin PROFILE)" = file ]; then echo "make pin: name the profile: make pin PROFILE=<name> (dsv4deploy list)" >&2; exit 2; fi
	$(BIN)/dsv4deploy pin $(PROFILE) $(if $(BRANCH),--branch $(BRANCH)) $(if $(INTO_BASE),--into-base)

sim-up: bootstrap
	$(BIN)/dsv4deploy sim up --hosts $(HOSTS)

sim-down: venv
	$(BIN)/dsv4deploy sim down

sim-status: venv
	$(BIN)/dsv4deploy sim status

# The profile is validated before pyinfra connects: a bad profile changes nothing.
plan: bootstrap
	$(BIN)/dsv4deploy validate $(PROFILE) >/dev/null || { $(BIN)/dsv4deploy validate $(PROFILE); exit 2; }
	$(if $(SIM),$(BIN)/dsv4deploy sim up --hosts $(HOSTS))
	$(BIN)/pyinfra --dry --diff $(INVENTORY) deploy/serve.py --data profile=$(PROFILE)

deploy: bootstrap
	$(BIN)/dsv4deploy validate $(PROFILE) >/dev/null || { $(BIN)/dsv4deploy validate $(PROFILE); exit 2; }
	$(if $(SIM),$(BIN)/dsv4deploy sim up --hosts $(HOSTS))
	$(BIN)/pyinfra -y $(INVENTORY) deploy/serve.py --data profile=$(PROFILE)

rollback: bootstrap
	$(BIN)/pyinfra -y $(INVENTORY) deploy/rollback.py $(if $(TO),--data to=$(TO))

history: venv
	$(BIN)/dsv4deploy history --inventory $(INVENTORY)

test: bootstrap
	$(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf rendered reports .pytest_cache
