# The README's two commands.  Each sets up what it needs on a fresh Debian machine:
# system packages when missing (as root, or through sudo), a virtualenv at .venv, the build.

VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.ssdemu-installed
DEMO    := demo-out
APT_PKGS := liburing-dev fio gcc python3-dev python3-venv util-linux

.PHONY: demo test lint system venv clean

demo: venv
	@mkdir -p $(DEMO)
	@echo "== ssdemu demo: the io_uring engine against fio, file-backed and memory media =="
	$(PY) -m ssdemu bench io --media file:$(DEMO)/drive.img:1G --rw randread --bs 4k --qd 32 --seconds 3
	$(PY) -m ssdemu bench io --media file:$(DEMO)/drive.img:1G --rw read --bs 1M --qd 16 --seconds 3
	$(PY) -m ssdemu bench io --media mem:1G --rw randread --bs 4k --qd 32 --seconds 3
	$(PY) -m ssdemu bench io --media mem:1G --rw read --bs 1M --qd 16 --seconds 3

test: venv
	$(PY) -m ruff check .
	$(PY) -m pytest -q

lint: venv
	$(PY) -m ruff check .

# System packages: installed only when something is missing.
system:
	@missing=""; \
	for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO=sudo; \
	  else echo "ssdemu: need root to install:$$missing" >&2; exit 1; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: system $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard c/*.c c/*.h c/*.py)
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

clean:
	rm -rf $(VENV) $(DEMO) build *.egg-info ssdemu/_engine*.so ssdemu/_engine.c
