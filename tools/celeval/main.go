// celeval compiles and evaluates DRA device selectors exactly as the kube-scheduler does, with Kubernetes' own
// k8s.io/dynamic-resource-allocation/cel at the pinned version: the compiler of cel.GetCompiler for the version's
// default feature gates, CompileCELExpression as cel.Cache.GetOrCompile calls it (StoredExpressions environment, no
// cost estimation, runtime cost limit resourceapi.CELSelectorExpressionMaxCost), then CompilationResult.DeviceMatches
// with the cel.Device the structured allocator builds. It is the reference side of tests/test_cel_differential.py.
//
// Input, one JSON object per stdin line:
//
//	{"id": "...", "expression": "...", "device": {"driver": "...", "attributes": {name: DeviceAttribute},
//	 "capacity": {name: {"value": quantity}}, "allowMultipleAllocations": bool}}
//
// Output, one line per input line, in order:
//
//	{"id": "...", "outcome": "true"|"false"|"compile_error"|"runtime_error"|"input_error", "message": "...",
//	 "cost": actual cost}
//
// Two optional modes change what each line answers (the default above is what tests/test_cel_differential.py reads):
//
//	-estimate: compile as the API server validates a new ResourceClaim/DeviceClass selector (NewExpressions
//	  environment, cost estimation on; pkg/apis/resource/validation.validateCELSelector) and answer
//	  {"id", "outcome": "ok"|"compile_error"|"too_complex", "message", "max_cost"}; the device is ignored.
//	-bench N: evaluate each line N times, each a cold evaluation as the allocator does it (a fresh cel.Device, whose
//	  attribute and capacity maps DeviceMatches rebuilds every call; the compiled program is reused, as the
//	  scheduler's cache does), and add "ns_per_op" to the default answer.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/dynamic-resource-allocation/cel"
)

type device struct {
	Driver                   string                                                    `json:"driver"`
	Attributes               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes"`
	Capacity                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity  `json:"capacity"`
	AllowMultipleAllocations *bool                                                     `json:"allowMultipleAllocations"`
}

type request struct {
	ID         string `json:"id"`
	Expression string `json:"expression"`
	Device     device `json:"device"`
}

type result struct {
	ID      string  `json:"id"`
	Outcome string  `json:"outcome"`
	Message string  `json:"message,omitempty"`
	Cost    *uint64 `json:"cost,omitempty"`
	MaxCost *uint64 `json:"max_cost,omitempty"`
	NsPerOp *int64  `json:"ns_per_op,omitempty"`
}

// evalTimeout bounds one evaluation like the scheduler's Filter timeout; the cost limit normally stops it first.
const evalTimeout = 10 * time.Second

func main() {
	// Kubernetes 1.37 defaults (as 1.36's): DRAConsumableCapacity is beta and on, DRAListTypeAttributes is alpha and off
	// (pkg/features/kube_features.go); the scheduler passes exactly these two to cel.NewCache.
	consumable := flag.Bool("consumable-capacity", true, "the DRAConsumableCapacity feature gate")
	listAttrs := flag.Bool("list-type-attributes", false, "the DRAListTypeAttributes feature gate")
	estimate := flag.Bool("estimate", false, "answer the API server's compile-time verdict and estimated max cost")
	bench := flag.Int("bench", 0, "evaluate each line this many times and report ns_per_op")
	flag.Parse()
	compiler := cel.GetCompiler(cel.Features{EnableConsumableCapacity: *consumable, EnableListTypeAttributes: *listAttrs})
	compiled := map[string]cel.CompilationResult{} // like the scheduler's cache, but unbounded: one run, few texts

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for in.Scan() {
		var req request
		var res result
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			res = result{ID: req.ID, Outcome: "input_error", Message: err.Error()}
		} else if *estimate {
			res = estimateCost(compiler, req)
		} else {
			expr, ok := compiled[req.Expression]
			if !ok {
				expr = compiler.CompileCELExpression(req.Expression, cel.Options{DisableCostEstimation: true})
				compiled[req.Expression] = expr
			}
			res = evaluate(req, expr)
			if *bench > 0 && res.Outcome != "panic" {
				res.NsPerOp = benchmark(req, expr, *bench)
			}
		}
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, "celeval:", err)
			os.Exit(1)
		}
		if err := out.Flush(); err != nil { // the caller may stream: answer each line at once
			fmt.Fprintln(os.Stderr, "celeval:", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "celeval:", err)
		os.Exit(1)
	}
}

// estimateCost is validateCELSelector without the length check: the verdict the API server gives a new selector.
func estimateCost(compiler interface {
	CompileCELExpression(string, cel.Options) cel.CompilationResult
}, req request) result {
	envType := environment.NewExpressions
	expr := compiler.CompileCELExpression(req.Expression, cel.Options{EnvType: &envType})
	res := result{ID: req.ID, Outcome: "ok"}
	switch {
	case expr.Error != nil:
		res.Outcome, res.Message = "compile_error", expr.Error.Error()
	case expr.MaxCost > resourceapi.CELSelectorExpressionMaxCost:
		res.Outcome, res.Message = "too_complex", "too complex, exceeds cost limit"
	}
	if expr.Error == nil {
		maxCost := expr.MaxCost
		res.MaxCost = &maxCost
	}
	return res
}

// benchBudget stops a benchmark early so an expensive selector (one near the cost limit) cannot stall the batch.
const benchBudget = 2 * time.Second

// benchmark times up to n cold evaluations of one selector on one device and returns the mean in nanoseconds.
func benchmark(req request, expr cel.CompilationResult, n int) *int64 {
	if expr.Error != nil {
		return nil
	}
	ctx := context.Background()
	d := req.Device
	start := time.Now()
	i := 0
	for ; i < n && time.Since(start) < benchBudget; i++ {
		_, _, _ = expr.DeviceMatches(ctx, cel.Device{
			Driver:                   d.Driver,
			AllowMultipleAllocations: d.AllowMultipleAllocations,
			Attributes:               d.Attributes,
			Capacity:                 d.Capacity,
		})
	}
	ns := time.Since(start).Nanoseconds() / int64(i)
	return &ns
}

// evaluate runs one compiled selector against one device; a panic in cel-go is reported, not fatal to the batch.
func evaluate(req request, expr cel.CompilationResult) (res result) {
	res.ID = req.ID
	if expr.Error != nil {
		res.Outcome, res.Message = "compile_error", expr.Error.Error()
		return res
	}
	defer func() {
		if r := recover(); r != nil {
			res.Outcome, res.Message = "panic", fmt.Sprint(r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), evalTimeout)
	defer cancel()
	d := req.Device
	matches, details, err := expr.DeviceMatches(ctx, cel.Device{
		Driver:                   d.Driver,
		AllowMultipleAllocations: d.AllowMultipleAllocations,
		Attributes:               d.Attributes,
		Capacity:                 d.Capacity,
	})
	if details != nil {
		res.Cost = details.ActualCost()
	}
	switch {
	case err != nil:
		res.Outcome, res.Message = "runtime_error", err.Error()
	case matches:
		res.Outcome = "true"
	default:
		res.Outcome = "false"
	}
	return res
}
