"""Pulumi ComponentResources of elastic-ctr (type tokens ``elastic-ctr:index:<Name>``)."""
from components.common import DeployContext
from components.cube_cluster import CubeCluster, CubeClusterArgs
from components.cube_transfer import CubeTransfer, CubeTransferArgs
from components.file_server import FileServer, FileServerArgs
from components.images import Images, ImagesArgs
from components.monitoring import Monitoring, MonitoringArgs
from components.serving import Serving, ServingArgs
from components.tracking_server import TrackingServer, TrackingServerArgs
from components.training_job import TrainingJob, TrainingJobArgs

__all__ = [
    "DeployContext", "CubeCluster", "CubeClusterArgs", "CubeTransfer", "CubeTransferArgs",
    "FileServer", "FileServerArgs", "Images", "ImagesArgs", "Monitoring", "MonitoringArgs", "Serving", "ServingArgs",
    "TrackingServer", "TrackingServerArgs", "TrainingJob", "TrainingJobArgs",
]
