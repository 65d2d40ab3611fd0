# Entry points; each is a thin wrapper around a script under tests/ or one cargo command.
.PHONY: demo demo-karpenter test package-check bench bench-compare soak multi-check-soak fuzz test-under-load test-kueue-versions up down status build-control-plane

demo: ## Start the control plane, the provisioning controller and the simulator; narrate two Jobs
	bash tests/demo.sh

demo-karpenter: ## Start the control plane and Karpenter, the capacity-buffer check; narrate a Job on Nodes Karpenter launches for it
	bash tests/demo-karpenter.sh

test: ## fmt, clippy, docs, unit tests and the end-to-end suite against a real Kueue
	bash tests/run-all.sh

package-check: ## What a crates.io release needs: dependency licenses, cargo package, docs.rs-style docs, the MSRV build
	bash tests/packaging.sh

bench: ## Measure an SDK check's answer latency and throughput on the local control plane (ARGS=...)
	bash tests/bench.sh $(ARGS)

bench-compare: ## Kueue's built-in ProvisioningRequest check and ours side by side: 300 and 1,000 Workloads, 1 and 3 podsets (ARGS=...)
	bash tests/bench-compare.sh $(ARGS)

soak: ## The chaos soak at full size (WORKLOADS=1000, SEED= to replay); results in target/soak/<seed>/
	SOAK_WORKLOADS=$(or $(WORKLOADS),1000) $(if $(SEED),SOAK_SEED=$(SEED)) bash tests/soak.sh

multi-check-soak: ## Long seeded multi-check property run on the local control plane (SEED=, WORKLOADS=200, IN_FLIGHT=16)
	MULTI_CHECK_SEED=$(SEED) MULTI_CHECK_WORKLOADS=$(or $(WORKLOADS),200) MULTI_CHECK_IN_FLIGHT=$(or $(IN_FLIGHT),16) \
		cargo test -p e2e --test multi_check -- --ignored --exact soak --nocapture

fuzz: ## Fuzz every pure function fed by cluster data (FUZZ_SECONDS=600, SEED= to replay; a crash is saved under target/fuzz-crashes)
	cargo run --locked --release -p fuzz-targets -- --seconds $(or $(FUZZ_SECONDS),600) $(if $(SEED),--seed $(SEED))

test-under-load: ## The e2e suite RUNS=3 times with a CPU hog on every core beside it (FILTER= to narrow)
	bash tests/under-load.sh

test-kueue-versions: ## The e2e suite against each supported Kueue version (KUEUE_VERSIONS="v0.15.2 v0.19.2")
	bash tests/kueue-versions.sh

up: ## Start the local control plane (etcd, kube-apiserver, Kueue)
	bash tests/control-plane/control-plane.sh start

down: ## Stop the local control plane
	bash tests/control-plane/control-plane.sh stop

status: ## Show what runs
	bash tests/control-plane/control-plane.sh status

build-control-plane: ## Only build the control plane binaries into the cache
	bash tests/control-plane/control-plane.sh build
