//! The test bed's kube-proxy for one Service: a loopback listener with a fixed port (the
//! Service's address, published once) that hands each connection to one of the ready
//! replicas, round robin. TLS passes through untouched, as it does through a ClusterIP, so
//! the hosted kube-apiserver shakes hands with whichever replica it reaches.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub(crate) struct ServiceProxy {
    pub(crate) port: u16,
    backends: Arc<Mutex<Vec<u16>>>,
    task: JoinHandle<()>,
}

impl ServiceProxy {
    pub(crate) async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let backends: Arc<Mutex<Vec<u16>>> = Arc::default();
        let next = Arc::new(AtomicUsize::new(0));
        let routes = backends.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let backend = {
                    let b = routes.lock().unwrap_or_else(PoisonError::into_inner);
                    (!b.is_empty()).then(|| b[next.fetch_add(1, Ordering::Relaxed) % b.len()])
                };
                // No ready replica: the connection is refused, as a Service without endpoints.
                let Some(backend) = backend else { continue };
                // Said aloud: a replica in the routes that does not answer is how a guarded
                // request reaches failurePolicy Ignore, and a test that sees one let through
                // needs to know. (Connections ending in a reset are not: the demo shows them in
                // steady state too.)
                tokio::spawn(async move {
                    match TcpStream::connect(("127.0.0.1", backend)).await {
                        Ok(mut server) => {
                            let _ = client.set_nodelay(true);
                            let _ = server.set_nodelay(true);
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                        Err(e) => eprintln!(
                            "[service proxy] the replica on port {backend}, in the routes, refused the connection ({e}): dropped"
                        ),
                    }
                });
            }
        });
        Ok(Self {
            port,
            backends,
            task,
        })
    }

    /// The replicas new connections go to (connections already open stay where they are).
    pub(crate) fn set_backends(&self, ports: Vec<u16>) {
        *self.backends.lock().unwrap_or_else(PoisonError::into_inner) = ports;
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
