# Pagewise: `make eval` runs every experiment in quick mode; `make test` runs the whole suite.
# Both install what a fresh machine of this kind lacks first.

SHELL := /bin/bash
CARGO ?= cargo
PAGEWISE := target/release/pagewise
EVAL_FLAGS ?= --quick

.PHONY: all build eval test deps fmt lint clean java java-test

all: build

# Debian packages the tests and experiments use, installed only when missing.
APT_PACKAGES := build-essential pkg-config iproute2 openjdk-17-jdk-headless maven
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup)"; exit 1; }

build: deps
	$(CARGO) build --release --workspace
	$(MAKE) java

eval: build
	$(PAGEWISE) eval all $(EVAL_FLAGS)

# The closing line sums every test binary's result ("N passed, N failed, N skipped").
test: build
	@set -o pipefail; $(CARGO) test --release --workspace 2>&1 | tee target/test.log
	@awk '/^test result:/ { p += $$4; f += $$6; s += $$8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' target/test.log
	$(MAKE) java-test

# The Java module (java/): JNI binding to hp_alloc, HugepageBuffers, the Spark agent and plugin.
# Packs target/release/libpagewise.so into java/target/pagewise-spark-0.1.0.jar.
MVN ?= mvn -q -B
java:
	cd java && $(MVN) package -DskipTests

java-test:
	cd java && $(MVN) test

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
