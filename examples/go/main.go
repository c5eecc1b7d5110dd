// The dev stack of elastic-ctr (Pulumi.dev.yaml) in Go, through the elastic-ctr component package:
// the same objects as examples/yaml/Pulumi.yaml, which the tests run against the Python program's
// rendering. Run from this directory (the Pulumi CLI and Go):
//
//	pulumi package add ../..    # generates sdks/elastic-ctr (module example.com/pulumi-elastic-ctr/sdk/go)
//	                            # and prints the `go mod edit -replace` line for it: run that
//	go mod tidy
//	pulumi stack init dev
//	pulumi config set --secret uploadToken "$(openssl rand -hex 32)"
//	pulumi up
//
// Inputs named like stack keys (ServingReplicas, CubeShards, ...) are those keys.
package main

import (
	"fmt"

	"example.com/pulumi-elastic-ctr/sdk/go/elasticctr"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/config"
)

func main() {
	pulumi.Run(func(ctx *pulumi.Context) error {
		uploadToken := config.RequireSecret(ctx, "uploadToken")
		instance := fmt.Sprintf("elastic-ctr-%s", ctx.Stack())

		ns, err := corev1.NewNamespace(ctx, "elastic-ctr-dev", &corev1.NamespaceArgs{
			Metadata: &metav1.ObjectMetaArgs{
				Name: pulumi.String("elastic-ctr-dev"),
				Labels: pulumi.StringMap{
					"app.kubernetes.io/name":             pulumi.String("elastic-ctr"),
					"app.kubernetes.io/instance":         pulumi.String(instance),
					"app.kubernetes.io/component":        pulumi.String("namespace"),
					"app.kubernetes.io/part-of":          pulumi.String("elastic-ctr"),
					"app.kubernetes.io/managed-by":       pulumi.String("pulumi"),
					"pod-security.kubernetes.io/enforce": pulumi.String("restricted"),
					"pod-security.kubernetes.io/audit":   pulumi.String("restricted"),
					"pod-security.kubernetes.io/warn":    pulumi.String("restricted"),
				},
			},
		})
		if err != nil {
			return err
		}
		namespace := ns.Metadata.Name().Elem()

		images, err := elasticctr.NewImages(ctx, "images", &elasticctr.ImagesArgs{
			ImageTag: pulumi.StringRef("dev"),
			Tracking: pulumi.BoolRef(true),
		})
		if err != nil {
			return err
		}
		credentials, err := elasticctr.NewCredentials(ctx, "credentials", &elasticctr.CredentialsArgs{
			Deployment:  elasticctr.DeploymentArgs{Namespace: namespace, Instance: instance},
			UploadToken: uploadToken,
		})
		if err != nil {
			return err
		}
		// every component but Credentials mounts the stack's credentials
		deployment := elasticctr.DeploymentArgs{Namespace: namespace, Instance: instance, Credentials: credentials.Secrets}

		fileserver, err := elasticctr.NewFileServer(ctx, "fileserver", &elasticctr.FileServerArgs{
			Deployment:            deployment,
			Image:                 images.Cube,
			UploadToken:           uploadToken,
			FileServerCpu:         pulumi.StringRef("250m"),
			FileServerMemory:      pulumi.StringRef("256Mi"),
			FileServerStorageSize: pulumi.StringRef("5Gi"),
		})
		if err != nil {
			return err
		}
		tracking, err := elasticctr.NewTrackingServer(ctx, "tracking", &elasticctr.TrackingServerArgs{
			Deployment: deployment,
			Image:      images.Tracking.Elem(), // set: the Images were built with Tracking
		})
		if err != nil {
			return err
		}
		training, err := elasticctr.NewTrainingJob(ctx, "ctr-train", &elasticctr.TrainingJobArgs{
			Deployment:        deployment,
			Image:             images.Trainer,
			VersionRoot:       fileserver.Url,
			UploadTokenSecret: fileserver.TokenSecret,
			UploadTokenKey:    fileserver.TokenKey,
			TrackingUri:       tracking.Url,
			Pservers:          pulumi.IntRef(1),
			Trainers:          pulumi.IntRef(2),
			Epochs:            pulumi.IntRef(1),
			BatchSize:         pulumi.IntRef(512),
			PserverCpu:        pulumi.StringRef("500m"),
			PserverMemory:     pulumi.StringRef("1Gi"),
			TrainerCpu:        pulumi.StringRef("1"),
			TrainerMemory:     pulumi.StringRef("2Gi"),
		})
		if err != nil {
			return err
		}
		cube, err := elasticctr.NewCubeCluster(ctx, "cube", &elasticctr.CubeClusterArgs{
			Deployment:       deployment,
			Image:            images.Cube,
			VersionRoot:      fileserver.Url,
			CubeShards:       pulumi.IntRef(2),
			CubeReplicas:     pulumi.IntRef(2),
			CubeServerCpu:    pulumi.StringRef("250m"),
			CubeServerMemory: pulumi.StringRef("512Mi"),
			CubeAgentCpu:     pulumi.StringRef("100m"),
			CubeAgentMemory:  pulumi.StringRef("256Mi"),
			CubeDataSize:     pulumi.StringRef("2Gi"),
		})
		if err != nil {
			return err
		}
		transfer, err := elasticctr.NewCubeTransfer(ctx, "cube-transfer", &elasticctr.CubeTransferArgs{
			Deployment:        deployment,
			Image:             images.Cube,
			TopologyConfigmap: cube.TopologyConfigmap,
			TopologyChecksum:  cube.TopologyChecksum,
			VersionRoot:       fileserver.Url,
			UploadTokenSecret: fileserver.TokenSecret,
			UploadTokenKey:    fileserver.TokenKey,
			TrackingUri:       tracking.Url,
			TrackingJob:       pulumi.StringRef(instance + "-ctr-train"),
			TransferCpu:       pulumi.StringRef("500m"),
			TransferMemory:    pulumi.StringRef("1Gi"),
		}, pulumi.DependsOn([]pulumi.Resource{cube}))
		if err != nil {
			return err
		}
		serving, err := elasticctr.NewServing(ctx, "serving", &elasticctr.ServingArgs{
			Deployment:        deployment,
			Image:             images.Serving,
			TopologyConfigmap: cube.TopologyConfigmap,
			TopologyChecksum:  cube.TopologyChecksum,
			VersionRoot:       fileserver.Url,
			TransferUrl:       transfer.Url,
			ServingReplicas:   pulumi.IntRef(2),
			ServingCpu:        pulumi.StringRef("500m"),
			ServingMemory:     pulumi.StringRef("1Gi"),
		}, pulumi.DependsOn([]pulumi.Resource{cube, transfer}))
		if err != nil {
			return err
		}

		// the components' names: NetworkPolicies and Monitoring select their pods by them
		parts := elasticctr.PartsArgs{
			FileServer:     pulumi.StringRef("fileserver"),
			TrackingServer: pulumi.StringRef("tracking"),
			TrainingJob:    "ctr-train",
			CubeTransfer:   "cube-transfer",
			Serving:        "serving",
		}
		if _, err := elasticctr.NewNetworkPolicies(ctx, "network", &elasticctr.NetworkPoliciesArgs{
			Deployment: deployment,
			Parts:      parts,
		}); err != nil {
			return err
		}
		monitoring, err := elasticctr.NewMonitoring(ctx, "monitoring", &elasticctr.MonitoringArgs{
			Deployment: deployment,
			Parts:      parts,
			Monitoring: pulumi.StringRef("prometheus-operator"),
		})
		if err != nil {
			return err
		}

		ctx.Export("namespace", namespace)
		ctx.Export("servingUrl", serving.Url)
		ctx.Export("servingGrpcTarget", serving.GrpcTarget)
		ctx.Export("fileServerUrl", fileserver.ExternalUrl)
		ctx.Export("fileServerClusterUrl", fileserver.Url)
		ctx.Export("transferStatusUrl", transfer.StatusUrl)
		ctx.Export("cubeTopology", cube.Topology)
		ctx.Export("trainingJob", pulumi.Sprintf("%s/%s", namespace, training.JobName))
		ctx.Export("trackingUrl", tracking.Url)
		ctx.Export("monitors", monitoring.Monitors)
		return nil
	})
}
