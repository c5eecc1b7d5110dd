module elastic-ctr-go

go 1.22

require (
	github.com/pulumi/pulumi-kubernetes/sdk/v4 v4.18.0
	github.com/pulumi/pulumi/sdk/v3 v3.168.0
)

// `pulumi package add ../..` generates the package's Go SDK under sdks/elastic-ctr (module
// example.com/pulumi-elastic-ctr/sdk/go) and prints the `go mod edit -replace` line that points that
// module there; `go mod tidy` then completes this file.
