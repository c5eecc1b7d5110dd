// The dev stack of elastic-ctr (Pulumi.dev.yaml) in TypeScript, through the elastic-ctr component
// package: the same objects as examples/yaml/Pulumi.yaml, which the tests run against the Python
// program's rendering. Run from this directory (the Pulumi CLI and Node.js):
//   pulumi package add ../..      # generates sdks/elastic-ctr and adds "@pulumi/elastic-ctr" to package.json
//   npm install
//   pulumi stack init dev
//   pulumi config set --secret uploadToken "$(openssl rand -hex 32)"
//   pulumi up
// Inputs named like stack keys (servingReplicas, cubeShards, ...) are those keys.
import * as pulumi from "@pulumi/pulumi";
import * as k8s from "@pulumi/kubernetes";
import * as ectr from "@pulumi/elastic-ctr";

const config = new pulumi.Config();
const uploadToken = config.requireSecret("uploadToken");
const instance = `elastic-ctr-${pulumi.getStack()}`;

const ns = new k8s.core.v1.Namespace("elastic-ctr-dev", {
    metadata: {
        name: "elastic-ctr-dev",
        labels: {
            "app.kubernetes.io/name": "elastic-ctr",
            "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/component": "namespace",
            "app.kubernetes.io/part-of": "elastic-ctr",
            "app.kubernetes.io/managed-by": "pulumi",
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/audit": "restricted",
            "pod-security.kubernetes.io/warn": "restricted",
        },
    },
});

const images = new ectr.Images("images", { imageTag: "dev", tracking: true });
const credentials = new ectr.Credentials("credentials", {
    deployment: { namespace: ns.metadata.name, instance },
    uploadToken,
});
// every component but Credentials mounts the stack's credentials
const deployment = { namespace: ns.metadata.name, instance, credentials: credentials.secrets };

const fileserver = new ectr.FileServer("fileserver", {
    deployment,
    image: images.cube,
    uploadToken,
    fileServerCpu: "250m",
    fileServerMemory: "256Mi",
    fileServerStorageSize: "5Gi",
});
const tracking = new ectr.TrackingServer("tracking", {
    deployment,
    image: images.tracking.apply(ref => ref!), // set: the Images were built with tracking
});
const training = new ectr.TrainingJob("ctr-train", {
    deployment,
    image: images.trainer,
    versionRoot: fileserver.url,
    uploadTokenSecret: fileserver.tokenSecret,
    uploadTokenKey: fileserver.tokenKey,
    trackingUri: tracking.url,
    pservers: 1,
    trainers: 2,
    epochs: 1,
    batchSize: 512,
    pserverCpu: "500m",
    pserverMemory: "1Gi",
    trainerCpu: "1",
    trainerMemory: "2Gi",
});
const cube = new ectr.CubeCluster("cube", {
    deployment,
    image: images.cube,
    versionRoot: fileserver.url,
    cubeShards: 2,
    cubeReplicas: 2,
    cubeServerCpu: "250m",
    cubeServerMemory: "512Mi",
    cubeAgentCpu: "100m",
    cubeAgentMemory: "256Mi",
    cubeDataSize: "2Gi",
});
const transfer = new ectr.CubeTransfer("cube-transfer", {
    deployment,
    image: images.cube,
    topologyConfigmap: cube.topologyConfigmap,
    topologyChecksum: cube.topologyChecksum,
    versionRoot: fileserver.url,
    uploadTokenSecret: fileserver.tokenSecret,
    uploadTokenKey: fileserver.tokenKey,
    trackingUri: tracking.url,
    trackingJob: `${instance}-ctr-train`,
    transferCpu: "500m",
    transferMemory: "1Gi",
}, { dependsOn: [cube] });
const serving = new ectr.Serving("serving", {
    deployment,
    image: images.serving,
    topologyConfigmap: cube.topologyConfigmap,
    topologyChecksum: cube.topologyChecksum,
    versionRoot: fileserver.url,
    transferUrl: transfer.url,
    servingReplicas: 2,
    servingCpu: "500m",
    servingMemory: "1Gi",
}, { dependsOn: [cube, transfer] });

// the components' names: NetworkPolicies and Monitoring select their pods by them
const parts = {
    fileServer: "fileserver",
    trackingServer: "tracking",
    trainingJob: "ctr-train",
    cubeTransfer: "cube-transfer",
    serving: "serving",
};
new ectr.NetworkPolicies("network", { deployment, parts });
const monitoring = new ectr.Monitoring("monitoring", { deployment, parts, monitoring: "prometheus-operator" });

export const namespace = ns.metadata.name;
export const servingUrl = serving.url;
export const servingGrpcTarget = serving.grpcTarget;
export const fileServerUrl = fileserver.externalUrl;
export const fileServerClusterUrl = fileserver.url;
export const transferStatusUrl = transfer.statusUrl;
export const cubeTopology = cube.topology;
export const trainingJob = pulumi.interpolate`${ns.metadata.name}/${training.jobName}`;
export const trackingUrl = tracking.url;
export const monitors = monitoring.monitors;
