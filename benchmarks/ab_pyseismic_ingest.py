"""A/B of pyseismic-lsr's two ways of ingesting documents, on SciFact SPLADE vectors: one
``add_document()`` per row with term names (tokens numbered in insertion order; what
``bench_sparse`` did at first) vs one CSR batch through ``add_documents_by_id()`` (vocabulary
ids as they are; what it does now, because the per-row path was too slow at 1M documents: see
benchmarks/HISTORY.md, "Learned-sparse leg").
Same build knobs as ``bench_sparse``'s SciFact sweep; CPU-time QPS, median of 3 after a warm-up, and
recall@10 against scipy exact. Run: ``python -m benchmarks.ab_pyseismic_ingest``."""
import sys, time, numpy as np, scipy.sparse as sp
from benchmarks import bench_sparse as bs
from seismic import SeismicDataset, SeismicIndex, get_seismic_string
(d_ptr,d_terms,d_w),(q_ptr,q_terms,q_w)=bs.scifact()
n=len(d_ptr)-1; nq=len(q_ptr)-1; V=int(max(d_terms.max(),q_terms.max()))+1
D=sp.csr_matrix((d_w,d_terms,d_ptr),shape=(n,V)); Q=sp.csr_matrix((q_w,q_terms,q_ptr),shape=(nq,V))
S=(Q@D.T).toarray(); truth=[list(np.argsort(-S[i],kind='stable')[:10]) for i in range(nq)]
st=get_seismic_string()
def old():
    ds=SeismicDataset(); names=d_terms.astype(str).astype(st)
    for i in range(n): ds.add_document(str(i), names[d_ptr[i]:d_ptr[i+1]], d_w[d_ptr[i]:d_ptr[i+1]])
    return ds
def new():
    row=np.repeat(np.arange(n),np.diff(d_ptr)); o=np.lexsort((d_terms,row))
    ds=SeismicDataset(dim=V); ds.add_documents_by_id([str(i) for i in range(n)], d_terms[o].astype(np.int64), d_w[o].astype(np.float32), d_ptr.astype(np.int64)); return ds
present=np.zeros(V,bool); present[d_terms]=True
qids=np.array([str(i) for i in range(nq)],dtype=st)
keep=[present[q_terms[q_ptr[i]:q_ptr[i+1]]] for i in range(nq)]
comps=[q_terms[q_ptr[i]:q_ptr[i+1]][keep[i]].astype(str).astype(st) for i in range(nq)]
vals=[q_w[q_ptr[i]:q_ptr[i+1]][keep[i]].astype(np.float32) for i in range(nq)]
for name,f in (("old",old),("new",new),("old",old),("new",new)):
    ix=SeismicIndex.build_from_dataset(f(), n_postings=1000, centroid_fraction=0.1, summary_energy=0.4, num_threads=1)
    for qc in (5,8,12):
        ts=[]
        for r in range(4):
            t=time.process_time(); res=ix.batch_search(qids,comps,vals,k=10,query_cut=qc,heap_factor=0.9,num_threads=1); ts.append(time.process_time()-t)
        byq={r[0][0]:[int(h[2]) for h in r] for r in res if r}
        rec=np.mean([len(set(byq.get(str(i),[]))&set(truth[i]))/10 for i in range(nq)])
        print(name, qc, 'qps %.0f'%(nq/np.median(ts[1:])), 'recall %.3f'%rec, flush=True)
